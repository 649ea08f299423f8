#!/usr/bin/perl

# The example configuration nginx-conf/s3.conf runs as shipped (ports, paths and the sync
# interval swapped for free ports and 200 ms) in front of the S3 application it is written
# for (examples/s3-app): bucket from the host or the path, type from the method, nginx
# checks the bucket quotas, the application accounts its handlers' quotas (children of
# the bucket quotas) and charges the bytes it sends, and the JSON access log carries
# $yarl_status.

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
$t->put_quota('s3_photos_get', 1000, 1000, 1000, 's3_photos_read');
# Bandwidth of GETs from "videos": 300 bytes, draining 1 byte/s.
$t->put_quota('s3_videos_bytes_out', 1, 300, 300);
$t->run_app(8081, 'A');

open my $fh, '<', "$FindBin::Bin/../nginx-conf/s3.conf" or die "s3.conf: $!\n";
my $conf = do { local $/; <$fh> };
close $fh;
my $root = $t->root_url('A');
$conf =~ s{load_module \S+;}{load_module $ENV{TEST_YARL_MODULE};};
$conf =~ s{yarl_roots http://127\.0\.0\.1:7700;}{yarl_roots $root;} or die "no yarl_roots\n";
$conf =~ s{yarl_sync_interval 1s;}{yarl_sync_interval 200ms;} or die "no yarl_sync_interval\n";
for my $p (8080, 8081) {
	my $free = $t->port($p);
	$conf =~ s/127\.0\.0\.1:$p\b/127.0.0.1:$free/g;
}
$conf =~ s{^pid .*$}{pid %%TESTDIR%%/nginx.pid;}m;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;\nuser root;}m if $> == 0;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;}m if $> != 0;
$t->write_file_expand('nginx.conf', $conf);

my ($rc, $out) = $t->test_config();
is($rc, 0, 'nginx -t accepts the example') or diag($out);
$t->run($t->port(8080));
my $p = $t->port(8080);
my $app = $t->port(8081);
ok($t->wait_for(sub {
	($t->stats($p, '/yarl/stats?quota=s3_photos_read')->{quota} // {})->{parent}
		&& ($t->stats($p, "/_yarl/status?quota=s3_photos_get")->{quota} // {})->{parent}
}, 10), 'quotas arrived at nginx and at the application (through nginx, /_yarl/)');

my %s3 = (Host => 's3.example.net');
my $r = http_request('PUT', $p, '/photos', \%s3, '');
is(status_of($r), 200, 'bucket created (path style)');
is(header_of($r, 'X-Yarl-Status'), 'UNLIMITED', 'writes have no quota: UNLIMITED');
is(status_of(http_request('PUT', $p, '/photos/cat.jpg', \%s3, 'meow')), 200, 'object stored');

# The application accounts s3_photos_get, whose parent s3_photos_read lets 3 units pass.
my @s = map {
	status_of(http_get($p, '/cat.jpg', Host => 'photos.s3.example.net'))
} 1 .. 4;
is_deeply(\@s, [(200) x 4], 'reads pass up to the read quota (virtual-host style)');
$r = http_get($p, '/photos/cat.jpg', %s3);
is(status_of($r), 429, 'read rejected over the quota (path style), 429 ...');
is(header_of($r, 'X-Yarl-Status'), 'PASSED', '... by the application: nginx did not know yet');
like($r, qr/SlowDown/, 'with the application\'s error body');
# nginx learns the application's counts through the root.
ok($t->wait_for(sub {
	$r = http_get($p, '/photos/cat.jpg', %s3);
	(header_of($r, 'X-Yarl-Status') // '') eq 'REJECTED';
}, 5), 'then nginx rejects the bucket\'s reads itself');
is(status_of($r), 429, 'with 429');
is(header_of($r, 'RateLimit-Policy'), '"s3_photos_read";q=4;w=400',
	'RateLimit-Policy: the chain up to the rejecting quota');
is(header_of($r, 'RateLimit'), '"s3_photos_read";r=0;t=' . header_of($r, 'Retry-After'),
	'RateLimit: nothing left, t = Retry-After');

# GETs of "videos" are charged their body bytes by the application after the response:
# two 200-byte objects fit in 300 bytes, the third GET is refused (by the application,
# which counted them; then by nginx, once it learnt the fill).
is(status_of(http_request('PUT', $p, '/videos', \%s3, '')), 200, 'bucket videos');
is(status_of(http_request('PUT', $p, '/videos/clip.mp4', \%s3, 'v' x 200)), 200, 'a clip');
ok($t->wait_for(sub {
	($t->stats($p, '/yarl/stats?quota=s3_videos_bytes_out')->{quota} // {})->{limit}
}, 5), 'bandwidth quota arrived');
my @v = map { status_of(http_get($p, '/videos/clip.mp4', %s3)) } 1 .. 3;
is_deeply(\@v, [200, 200, 429], 'the bandwidth quota refuses the third GET');
my $q = $t->stats($p, '/_yarl/status?quota=s3_videos_bytes_out')->{quota};
cmp_ok($q->{fill}, '>=', 399, "the two answers' bytes were charged ($q->{fill})");
ok($t->wait_for(sub {
	(header_of(http_get($p, '/videos/clip.mp4', %s3), 'X-Yarl-Status') // '') eq 'REJECTED'
}, 5), 'nginx checks the bandwidth quota the application charges');

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
