#!/usr/bin/perl

# The example configuration nginx-conf/s3.conf runs as shipped (ports and paths swapped for
# free ones): bucket from the host or the path, type from the method, the balancer checks,
# the application accounts, and the JSON access log carries $yarl_status.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get http_request status_of header_of);
use JSON::PP ();

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('s3_photos', 1000, 1000, 1000);
$t->put_quota('s3_photos_read', 0.01, 3, 3, 's3_photos');
# Bandwidth of GETs from "videos": 300 bytes, draining 1 byte/s.
$t->put_quota('s3_videos_bytes_out', 1, 300, 300);

open my $fh, '<', "$FindBin::Bin/../nginx-conf/s3.conf" or die "s3.conf: $!\n";
my $conf = do { local $/; <$fh> };
close $fh;
my $root = $t->root_url('A');
$conf =~ s{load_module \S+;}{load_module $ENV{TEST_YARL_MODULE};};
$conf =~ s{http://127\.0\.0\.1:7700}{$root};
for my $p (8080, 8081, 8082) {
	my $free = $t->port($p);
	$conf =~ s/127\.0\.0\.1:$p\b/127.0.0.1:$free/g;
}
$conf =~ s{^pid .*$}{pid %%TESTDIR%%/nginx.pid;}m;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;\nuser root;}m if $> == 0;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;}m if $> != 0;
$t->write_file_expand('nginx.conf', $conf);

my ($rc, $out) = $t->test_config();
is($rc, 0, 'nginx -t accepts the example') or diag($out);
$t->run();
my $p = $t->port(8080);
ok($t->wait_for(sub {
	($t->stats($p, '/yarl/stats?quota=s3_photos_read')->{quota} // {})->{parent}
}, 5), 'quotas arrived');

my @s = map {
	status_of(http_get($p, '/cat.jpg', Host => 'photos.s3.example.net'))
} 1 .. 4;
is_deeply(\@s, [(200) x 4], 'reads pass up to the read quota (virtual-host style)');
my $r = http_get($p, '/photos/cat.jpg', Host => 's3.example.net');
is(status_of($r), 429, 'read rejected over the quota (path style), 429');
is(header_of($r, 'X-Yarl-Status'), 'REJECTED', 'X-Yarl-Status REJECTED');
$r = http_request('PUT', $p, '/photos/new.jpg', { Host => 's3.example.net' }, 'abcdef');
is(status_of($r), 200, 'writes have their own quota (none: pass)');
is(header_of($r, 'X-Yarl-Status'), 'UNLIMITED', 'write UNLIMITED');
$r = http_get($p, '/cat.jpg', Host => 'photos.s3.example.net');
is(header_of($r, 'RateLimit-Policy'), '"s3_photos_read";q=4;w=400',
	'RateLimit-Policy: the chain up to the rejecting quota');
is(header_of($r, 'RateLimit'), '"s3_photos_read";r=0;t=' . header_of($r, 'Retry-After'),
	'RateLimit: nothing left, t = Retry-After');

# GETs of "videos" are charged their response bytes after the response: two fit in 300
# bytes, the third is refused by the bandwidth quota; a PUT is not charged.
ok($t->wait_for(sub { $t->stats($p, '/yarl/stats?quota=s3_videos_bytes_out')->{quota} }, 5),
	'bandwidth quota arrived');
my @v = map { status_of(http_get($p, '/videos/clip.mp4', Host => 's3.example.net')) } 1 .. 3;
is_deeply(\@v, [200, 200, 429], 'the bandwidth quota refuses the third GET');
my $q = $t->stats($p, '/yarl/stats?quota=s3_videos_bytes_out')->{quota};
cmp_ok($q->{fill}, '>', 300, "the two answers' bytes were charged ($q->{fill})");

$t->finish();

my @log = map { JSON::PP->new->decode($_) } grep { /\S/ } split /\n/, $t->read_file('logs/access.json');
my ($rej) = grep { $_->{yarl_status} eq 'REJECTED' } @log;
ok($rej, 'JSON access log has the rejection');
is($rej && $rej->{yarl_quota}, 's3_photos_read', 'JSON log names the quota');
is($rej && $rej->{bucket}, 'photos', 'bucket from the path');
is((grep { $_->{method} eq 'PUT' } @log)[0]{type}, 'write', 'PUT is a write');
my ($bw) = grep { $_->{yarl_status} eq 'REJECTED' && $_->{bucket} eq 'videos' } @log;
is($bw && $bw->{yarl_quota}, 's3_videos_bytes_out', 'the bandwidth rejection names its quota');
done_testing();
